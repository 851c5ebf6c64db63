"""Every method's printed ε next to dp-accounting's recomputation: ``python scripts/epsilon_check.py [--out DIR]``."""

from silofl.experiments.epsilon_check import main

if __name__ == "__main__":
    main()
