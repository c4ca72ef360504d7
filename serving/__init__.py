"""The serving engine: paged KV cache, scheduler, model runner, OpenAI-compatible server.

`from graft.serving import Engine, EngineConfig, SamplingParams` is the public entry point.
"""

from graft.serving.engine.config import EngineConfig
from graft.serving.engine.engine import Engine, EngineStats
from graft.serving.engine.mm_inputs import ImageRange, MultiModalInputs
from graft.serving.engine.outputs import RequestOutput
from graft.serving.engine.sampling_params import SamplingParams

__all__ = ["Engine", "EngineConfig", "EngineStats", "ImageRange", "MultiModalInputs",
           "RequestOutput", "SamplingParams"]
