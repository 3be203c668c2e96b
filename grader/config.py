"""Run settings (pydantic, ``extra="forbid"``), each translated per backend by one method."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class SamplingConfig(BaseModel):
    """How the judge samples. Defaults: greedy, fixed seed: a rerun gives the same grades."""

    model_config = ConfigDict(extra="forbid")

    temperature: float = Field(0.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0, description="0 disables top-k")
    seed: int = 0
    max_tokens: int | None = Field(None, gt=0, description="default: from the schema's bounds")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def to_transformers_kwargs(self, max_tokens: int) -> dict[str, Any]:
        """Keyword arguments for ``transformers.GenerationConfig``."""
        kwargs: dict[str, Any] = {"max_new_tokens": self.max_tokens or max_tokens}
        if self.greedy:
            kwargs["do_sample"] = False
        else:
            kwargs.update(
                do_sample=True, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k
            )
        return kwargs

    def to_vllm_kwargs(self, max_tokens: int) -> dict[str, Any]:
        """Keyword arguments for ``vllm.SamplingParams`` (structured outputs added by the backend)."""
        return {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "seed": self.seed,
            "max_tokens": self.max_tokens or max_tokens,
        }


class TransformersConfig(BaseModel):
    """Settings of the transformers backend."""

    model_config = ConfigDict(extra="forbid")

    batch_size: int = Field(8, gt=0)
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16
    trust_remote_code: bool = False
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)
