"""`python -m graphsafe_sampler.demo ...`: the demo alone, with the options of
`graphsafe-sampler demo`."""

import argparse
import sys

from graphsafe_sampler.demo.options import add_demo_arguments
from graphsafe_sampler.demo.run import run_demo

if __name__ == "__main__":
    _parser = argparse.ArgumentParser(prog="python -m graphsafe_sampler.demo")
    add_demo_arguments(_parser)
    sys.exit(run_demo(_parser.parse_args()))
