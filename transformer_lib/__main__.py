"""`python -m transformer_lib doctor`: check the environment (see transformer_lib/doctor.py)."""
import sys

if sys.argv[1:] != ["doctor"]:
    sys.exit("usage: python -m transformer_lib doctor")

from transformer_lib.doctor import main

sys.exit(main())
