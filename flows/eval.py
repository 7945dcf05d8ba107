"""``python -m flows.eval`` (the same as ``python -m flows eval``) and Prefect's entrypoint
``flows/eval.py:evaluate``; the eval flow itself is :mod:`flows.evaluation`'s."""

if __name__ == "__main__":  # the command line checks the config before loading the stack
    import sys

    from flows.cli import main

    main(["eval", *sys.argv[1:]])
else:
    from flows.evaluation import evaluate  # noqa: F401 - Prefect's entrypoint eval.py:evaluate
