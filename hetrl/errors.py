"""Errors hetrl raises on purpose.

`UsageError` is bad user input (an unknown env id, an ill-typed setting, a corrupt run
directory ...). Its message names the problem and the fix in one line; the CLI prints it
as ``error: <message>`` and exits with status 2, never with a traceback.
"""


class HetrlError(Exception):
    """Base class of every error hetrl raises on purpose."""


class UsageError(HetrlError):
    """Bad user input; the CLI prints 'error: <msg>' and exits 2."""


class LearnContractError(UsageError):
    """An algorithm's `learn` broke the protocol (docs/extending.md) on a run's first learner call: it did not
    return |TD| as a finite float tensor of shape (K, B), or did not add K to `updates`. One line names the
    algorithm and `learn`; the learner's state is not checkpointed (`learner_ok`)."""

    learner_ok = False


class NonFiniteError(HetrlError):
    """NaN or inf in the data an actor inserted or in the learner's TD errors. `learner_ok`: the
    learner's state is still finite (the bad data never reached it), so it may be checkpointed."""

    def __init__(self, message: str, learner_ok: bool = True):
        super().__init__(message)
        self.learner_ok = learner_ok
