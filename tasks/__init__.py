"""The Prefect side of a stage: one task (``stage.stage``) that runs any stage of any
declared algorithm, skipping what the run's manifest already holds."""
