"""The configuration: one schema (schema.py: frozen dataclasses, the configuration reference is generated from
them), the validator that reads YAML into it with every mistake's key path (validate.py, report.py), and the foreign
dialects translated into it (nereid.py, rs_infer.py)."""

from .schema import (
    ACCELERATOR_MAX_TOKENS,
    CPU_MAX_PADDING,
    CPU_MAX_TOKENS,
    DTYPE_ALIASES,
    EPS,
    BatchingConfig,
    CacheConfig,
    Config,
    ModelConfig,
    RateLimitConfig,
    ServerConfig,
    TracingConfig,
    VersionConfig,
    WarmupConfig,
    WarmupInput,
    hub_cache_dir,
    normalize_dtype,
    opt,
    split_bind,
)
from .validate import load_config, parse_config

__all__ = ["ACCELERATOR_MAX_TOKENS", "CPU_MAX_PADDING", "CPU_MAX_TOKENS", "DTYPE_ALIASES", "EPS", "BatchingConfig",
           "CacheConfig", "Config", "ModelConfig", "RateLimitConfig", "ServerConfig", "TracingConfig",
           "VersionConfig", "WarmupConfig", "WarmupInput", "hub_cache_dir", "load_config", "normalize_dtype", "opt",
           "parse_config", "split_bind"]
