"""`python -m gpupool`: the launcher (see gpupool._launcher)."""
import sys

from ._launcher import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
