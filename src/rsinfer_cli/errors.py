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
    └── EngineUnavailable             server_error        the engine process is gone (503)

Errors carry structure (`param`, `model`) and say what to do next; status codes live in the
transports, never here.
"""

from __future__ import annotations


class RsinferError(Exception):
    type = "server_error"

    def __init__(self, message: str, *, param: str | None = None, model: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.model = model

    def __str__(self) -> str:
        return self.message


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
        return f"Request for unknown model: '{self.model}' is not found"


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
