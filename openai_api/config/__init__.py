"""The model config (`model_config.json`): pydantic models of the seed format plus optional extensions.

The seed format has four arrays: `model_infos` (generation defaults per LLM, keyed by `name`),
`llm`, `embedding` and `rerank`. Everything added by this gateway is an optional key with a default,
so a seed config loads unchanged. `load_config` reports any problem as one `ConfigError` line that
names the file, the field and the reason.

This is the package's face: the rest of the code imports every public name from here. Its modules, each importing
only those before it: `problems` (`ConfigError`, and the strict base of every model), `serving` (url, routing,
discovery: what every entry shares), `entries` (one model per kind of entry), `gateway` (the whole file and the
naming rules across entries), `files` (the bundled data, and the paths, templates and tokenizers an entry names),
`adapters` (the LLMs' LoRA adapters), `loader` (`load_config`, `check_config`).
"""

from openai_api.config.adapters import adapters_of, resolve_adapters
from openai_api.config.entries import (
    EmbeddingModel,
    LLMModel,
    LLMProtocol,
    LoraAdapterEntry,
    ModelInfo,
    RerankModel,
    RerankOutputConfig,
    TextParam,
    TextProtocolConfig,
    Transport,
)
from openai_api.config.files import BUNDLED_CONFIG, BUNDLED_TEMPLATES, PACKAGE_ROOT
from openai_api.config.gateway import GatewayConfig, naming_problems
from openai_api.config.loader import check_config, load_config
from openai_api.config.problems import ConfigError
from openai_api.config.serving import DNS_SCHEME, DiscoveryConfig, RoutingConfig, RoutingPolicy

__all__ = [
    "BUNDLED_CONFIG", "BUNDLED_TEMPLATES", "DNS_SCHEME", "PACKAGE_ROOT",
    "ConfigError", "DiscoveryConfig", "EmbeddingModel", "GatewayConfig", "LLMModel", "LLMProtocol",
    "LoraAdapterEntry", "ModelInfo", "RerankModel", "RerankOutputConfig", "RoutingConfig", "RoutingPolicy",
    "TextParam", "TextProtocolConfig", "Transport", "adapters_of", "check_config", "load_config",
    "naming_problems", "resolve_adapters",
]
