"""The transport-free error tree; the CLI and the daemon each map it in one place.

    RsinferError                      type: stable string a client can match
    ├── ConfigError                   config_error        a config file or option is wrong
    ├── HubError                      hub_error           resolving or fetching model files failed
    │   └── RepoAccessError           hub_error           repo missing, gated or private
    ├── ModelLoadError                model_load_error    a model cannot be served as configured
    ├── InputError                    invalid_request_error  bad request / input data
    │   ├── KindMismatch              invalid_request_error  model of another kind named
    │   ├── PayloadTooLarge           invalid_request_error  too many rows / documents
    │   └── TokenizeError             invalid_request_error  the tokenizer rejected the input
    ├── ModelNotFound                 model_not_found
    │   └── VersionNotFound           model_not_found     the model has no such version
    ├── Saturated                     rate_limit_error    waiter budget of a model exhausted
    ├── PoolTimeout                   timeout_error       waited too long for a session slot
    ├── InferenceError                server_error        the forward failed
    ├── DeadlinePassed                timeout_error       the request's work stopped at its deadline
    └── EngineUnavailable             server_error        the engine process is gone (503)

Errors carry structure (`param`, `model`) and say what to do next; status codes live in the
transports, never here.
"""

from __future__ import annotations

import os
import re

# an absolute path in a message: its first folder must exist on this host (/srv, /home, /tmp, ...), so the routes
# an error names (/v2/models/...) are never taken for one
_PATH = re.compile(r"(?<![\w/:.~-])/[^\s'\"`:,;()<>\[\]{}]+")
_LONG = re.compile(r"'([^']{129,})'")
SHOWN_CHARS = 64


def public_text(text: str) -> str:
    """A message as a client may read it: an absolute path of this host becomes its last part (the model folder's
    or file's name: `…/minilm`), the full path staying in the log; a quoted value longer than 128 characters (a
    model name nobody has) is cut to its first 64 and its length."""
    def path(m: re.Match[str]) -> str:
        value = m.group()
        parts = [p for p in value.split("/") if p]
        if len(parts) < 2 or not os.path.isdir("/" + parts[0]):
            return value
        return "…/" + parts[-1]

    text = _PATH.sub(path, text) if "/" in text else text
    return _LONG.sub(lambda m: f"'{m.group(1)[:SHOWN_CHARS]}…' ({len(m.group(1))} characters)", text)


class RsinferError(Exception):
    type = "server_error"

    def __init__(self, message: str, *, param: str | None = None, model: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.model = model

    def __str__(self) -> str:
        return self.message

    @property
    def public(self) -> str:
        """The message without this host's paths or overlong values (public_text): what a client is told."""
        return public_text(self.message)


class ConfigError(RsinferError):
    type = "config_error"


class HubError(RsinferError):
    type = "hub_error"


class RepoAccessError(HubError):
    """The repository does not exist, is gated, or is private."""


class ModelLoadError(RsinferError):
    type = "model_load_error"


class InputError(RsinferError):
    type = "invalid_request_error"


class KindMismatch(InputError):
    pass


class PayloadTooLarge(InputError):
    pass


class TokenizeError(InputError):
    pass


class ModelNotFound(RsinferError):
    type = "model_not_found"


class VersionNotFound(ModelNotFound):
    pass


class UnknownModel(ModelNotFound):
    """A name no model of the config has. The KServe fronts say it in Triton's words, which its clients check."""

    @property
    def triton(self) -> str:
        return public_text(f"Request for unknown model: '{self.model}' is not found")


class Saturated(RsinferError):
    type = "rate_limit_error"


class PoolTimeout(RsinferError):
    type = "timeout_error"


class QualityGateFailed(RsinferError):
    """A graph (quantized, or on another execution provider) lost more against the original than a quality bar
    allows (`rsinfer quantize`, `rsinfer bench --compare`)."""

    type = "quality_gate"


class InferenceError(RsinferError):
    type = "server_error"


class EngineUnavailable(RsinferError):
    """The engine process that runs this model's forwards exited (multi-process serving)."""

    type = "server_error"


class NotAllowed(RsinferError):
    """An operation this server's configuration turns off (the repository API without `server.model_control`)."""

    type = "permission_error"


class DeadlinePassed(RsinferError):
    """A request's work stopped at a checkpoint: its deadline passed or its caller went away (engine/cancel.py)."""

    type = "timeout_error"
