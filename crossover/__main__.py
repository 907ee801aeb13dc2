import sys

from crossover.cli import console_main

sys.exit(console_main())
