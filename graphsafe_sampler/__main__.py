"""`python -m graphsafe_sampler ...`: the same command line as `graphsafe-sampler`."""

import sys

from graphsafe_sampler.cli import main

if __name__ == "__main__":
    sys.exit(main())
