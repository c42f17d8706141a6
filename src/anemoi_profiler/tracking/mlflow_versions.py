"""What differs between the MLflow versions the profiler supports (2.16 to 3.x), here alone.

The profiler talks to MLflow through its public client (`MlflowClient`, `mlflow.entities`, `mlflow.exceptions`,
`mlflow.artifacts`), which holds across that range. What does not hold is named below with the versions it holds
in; tests/unit/test_mlflow_versions.py checks each against the installed MLflow, on every stack of the version matrix
(ci/matrix). The versions are read from the packages' metadata: nothing here imports MLflow.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

MAX_TAG_VALUE_CHARS = 5000
"""The longest tag value every supported store keeps (`mlflow.utils.validation.MAX_TAG_VAL_LENGTH`): 5,000 characters
in MLflow 2.x, 8,000 in 3.x. A run's description is a tag, and the server's version decides, not the client's."""

MODEL_TRAINING_VIEW = "workflowType=machine_learning"
"""The URL parameter that opens a run in the model-training view of MLflow >= 3.0's UI (which otherwise shows the view
the browser used last, GenAI at first); MLflow 2.x has one view and ignores it."""

EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
"""The experiment tag MLflow >= 3.0's UI reads for an experiment's kind; on 2.x it is a plain tag."""

FILE_STORE_REFUSED_FROM = (3, 13)
"""MLflow refuses the `./mlruns` file store from 3.13 on (`MLFLOW_ALLOW_FILE_STORE` lifts it); hence the embedded
sqlite default."""

SQLALCHEMY_WITHOUT_MLFLOW_2_POOL = (2, 1)
"""MLflow 2.x's sqlite store imports `FallbackAsyncAdaptedQueuePool`, which SQLAlchemy 2.1 removed: with MLflow < 3
and SQLAlchemy >= 2.1 no sqlite store opens (`sqlite_store_problem`)."""


SQLITE_STORE_MAKES_MLRUNS_BEFORE = (3, 0)
"""MLflow 2.x's sqlite store makes its default artifact root, an empty `./mlruns` in the working folder, whenever a
client opens it (the user's MLFlowLogger included; seen with 2.16, not with 3.17); the profiler's artifacts still go
beside the database."""

PROXIED_ARTIFACTS_NEED_GLOBAL_URI_BEFORE = (3, 0)
"""MLflow 2.x uploads to a server's proxied artifact store (`mlflow-artifacts:`, `--artifacts-destination`) through
the process-global tracking URI, not the client's, and refuses with the default `file:` one ("tracking uri scheme:
'file' is invalid for use with the proxy mlflow-artifact scheme"; seen with 2.16, not with 3.17). The sender process,
MLflow's only user in its process, sets the global URI to its target's there (`MlflowTarget.client`)."""


def installed_version(distribution: str) -> tuple[int, int] | None:
    """(major, minor) of an installed distribution, None when it is not installed."""
    try:
        major, minor, *_ = version(distribution).split(".")
        return int(major), int("".join(digit for digit in minor if digit.isdigit()) or 0)
    except (PackageNotFoundError, ValueError):
        return None


def mlflow_version() -> tuple[int, int] | None:
    """The installed MLflow client's (major, minor): `mlflow`, or `mlflow-skinny` alone."""
    return installed_version("mlflow") or installed_version("mlflow-skinny")


def sqlite_store_problem() -> str | None:
    """Why MLflow's sqlite store (the embedded default) cannot open with the installed packages, and the fix; None
    when it can."""
    mlflow, sqlalchemy = mlflow_version(), installed_version("sqlalchemy")
    if mlflow is None or sqlalchemy is None:
        return None
    if mlflow < (3, 0) and sqlalchemy >= SQLALCHEMY_WITHOUT_MLFLOW_2_POOL:
        mlflow_text, sqlalchemy_text = ".".join(map(str, mlflow)), ".".join(map(str, sqlalchemy))
        return (
            f"MLflow {mlflow_text}'s sqlite store does not work with SQLAlchemy {sqlalchemy_text}"
            " (it imports a name SQLAlchemy 2.1 removed): pip install 'sqlalchemy<2.1', or upgrade MLflow to 3.x,"
            " or set tracking.uri to an MLflow server"
        )
    return None
