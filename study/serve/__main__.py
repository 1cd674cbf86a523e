import sys

from study.serve.cli import main

sys.exit(main())
