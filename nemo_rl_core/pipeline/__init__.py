"""Algorithms as pipelines of restartable stages, free of any orchestrator.

``spec`` declares an algorithm once (its config class and its stages, each with the stored
inputs it reads and the core function it calls); ``algorithms`` holds the declarations;
``stages`` the functions they call; ``context`` what a stage reads and returns; ``runtime``
the warm objects (models, engines, environments) one process keeps for a run. The Prefect
flows and tasks (``flows/``, ``tasks/``) are derived from the declarations.
"""
