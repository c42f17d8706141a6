"""The test suite: real fits, real MLflow stores and servers, real processes."""
