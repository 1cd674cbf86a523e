import sys

from study.report.cli import main

sys.exit(main())
