"""What a VFL party process imports, in one module, so that a launcher's fork server
(:mod:`parties.core.zygote`) can import it once and fork each party from it.

A party started as ``python -m parties`` spends about 4 s of CPU importing torch, pandas,
scikit-learn's encoders and SciPy before it reads a row, and another 1.7 s in its first
``torch.optim`` optimizer (``Optimizer.add_param_group`` imports ``torch._dynamo``, about
1,900 modules, whether or not anything is compiled). A party forked from a process that
has already imported them starts in milliseconds.

Importing this module only imports: it creates no tensor, thread, socket or random state
(each party seeds its own generators after it starts; see :func:`parties.privacy.dp.worker_seeds`).
"""

from __future__ import annotations

import torch
import torch._dynamo  # noqa: F401  (imported by the first optimizer otherwise)
import torch.optim  # noqa: F401

import parties.data  # noqa: F401
import parties.privacy.dp  # noqa: F401
import parties.privacy.dpsgd  # noqa: F401
import parties.runtime.predict  # noqa: F401
import parties.runtime.party  # noqa: F401
import parties.runtime.serve  # noqa: F401
import parties.core.tasks  # noqa: F401
import parties.planning.sweep  # noqa: F401
import parties.planning.profile  # noqa: F401
import parties.runtime.workers  # noqa: F401

# the encoders parties.data builds (imported there lazily so launchers need not load them)
import sklearn.compose  # noqa: F401
import sklearn.impute  # noqa: F401
import sklearn.metrics  # noqa: F401
import sklearn.pipeline  # noqa: F401
import sklearn.preprocessing  # noqa: F401
