"""`tracking.sender.describe`: why MLflow did not take a batch, in a few words, from the errors MLflow raises."""

from __future__ import annotations

import pytest
from mlflow.exceptions import MlflowException
from urllib3.exceptions import MaxRetryError, ResponseError

from anemoi_profiler.tracking.sender import describe


def raised_from(error: BaseException, cause: BaseException) -> BaseException:
    try:
        raise error from cause
    except BaseException as raised:
        return raised


@pytest.mark.parametrize(
    ("error", "said"),
    [
        (
            raised_from(
                MlflowException("API request to http://h/api failed with exception HTTPConnectionPool(...)"),
                MaxRetryError(None, "/api", ResponseError("too many 500 error responses")),  # type: ignore[arg-type]
            ),
            "HTTP 500 on every request",
        ),
        (
            MlflowException(
                "API request to endpoint /api/2.0/mlflow/experiments/get-by-name failed with error code 503 != 200."
                " Response body: '<html>unavailable</html>'"
            ),
            "HTTP 503 from the server",
        ),
        (
            raised_from(MlflowException("API request failed"), ConnectionRefusedError(111, "refused")),
            "connection refused",
        ),
    ],
)
def test_mlflows_errors_are_named_by_their_cause(error: BaseException, said: str) -> None:
    assert describe(error) == said


def test_an_unknown_error_keeps_its_type_and_first_line_without_credentials() -> None:
    said = describe(RuntimeError("no run at https://alice:s3cret@example.org/mlflow\nsecond line"))
    assert said.startswith("RuntimeError: no run at https://") and "s3cret" not in said and "second" not in said
