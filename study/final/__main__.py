import sys

from study.final.cli import main

sys.exit(main())
