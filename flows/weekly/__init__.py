"""The weekly loop's simulation harness (scripts/weeks.py): it drives the real flow week after
week and reads its outcome back from Prefect's API and MLflow, so it lives beside the flows,
above the library (searchrl/simulation/ keeps the world's changes and the report)."""
