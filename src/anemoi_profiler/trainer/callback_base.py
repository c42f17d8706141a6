"""The base class that both Lightning namespaces' trainers accept.

anemoi uses `pytorch_lightning`, most others `lightning.pytorch`: two packages with two `Callback` classes. Both
trainers call hooks by name, but `pytorch_lightning`'s Trainer before 2.6 also checks every callback with
`isinstance(callback, pytorch_lightning.Callback)` (`is_overridden` in `_validate_callbacks_list`) and refuses
any other with "Expected a parent". Where `pytorch_lightning` is installed, the profiler's callbacks therefore derive
from both classes (they hold no state of their own, only the hooks); elsewhere from `lightning.pytorch`'s alone.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

from lightning.pytorch.callbacks import Callback as _LightningCallback

if TYPE_CHECKING or importlib.util.find_spec("pytorch_lightning") is None:
    Callback = _LightningCallback
else:
    from pytorch_lightning.callbacks import Callback as _PytorchLightningCallback

    class Callback(_LightningCallback, _PytorchLightningCallback):
        """A callback of both namespaces (see the module's docstring)."""
