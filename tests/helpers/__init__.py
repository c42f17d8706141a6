"""Test helpers: small Lightning models, a real MLflow server, jobs run in their own processes."""
