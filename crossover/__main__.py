import sys

from crossover.cli import main

sys.exit(main())
