import sys

from study.launch.cli import main

sys.exit(main())
