"""HTTP request types (pydantic). Unknown fields are accepted and ignored, as OpenAI clients send
many; fields that would change the answer in ways Reflex does not support are refused in app.py."""
from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr

Number = StrictFloat  # strict: accepts ints, refuses strings and bools


class _Req(BaseModel):
    model_config = ConfigDict(extra="allow")


class ContentPart(_Req):
    type: StrictStr
    text: Optional[StrictStr] = None


class Message(_Req):
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: Union[StrictStr, list[ContentPart], None] = None


class StreamOptions(_Req):
    include_usage: StrictBool = False


class Retrieval(_Req):
    """Extension: retrieve from a named index and put the chunks in the prompt."""
    index: StrictStr
    top_k: StrictInt = Field(4, ge=1, le=50)


class ChatRequest(_Req):
    model: StrictStr
    messages: list[Message] = Field(min_length=1)
    max_tokens: Optional[StrictInt] = Field(None, ge=1)
    max_completion_tokens: Optional[StrictInt] = Field(None, ge=1)
    temperature: Optional[Number] = Field(None, ge=0, le=2)
    top_p: Optional[Number] = Field(None, gt=0, le=1)
    seed: Optional[StrictInt] = None
    stop: Union[StrictStr, list[StrictStr], None] = None
    n: Optional[StrictInt] = 1
    stream: StrictBool = False
    stream_options: Optional[StreamOptions] = None
    frequency_penalty: Optional[Number] = 0
    presence_penalty: Optional[Number] = 0
    logprobs: Optional[StrictBool] = False
    tools: Optional[list[Any]] = None
    response_format: Optional[dict] = None
    # extensions (llama.cpp-server style names)
    top_k: Optional[StrictInt] = Field(None, ge=0)
    min_p: Optional[Number] = Field(None, ge=0, le=1)
    repeat_penalty: Optional[Number] = Field(None, gt=0)
    retrieval: Optional[Retrieval] = None


class EmbeddingRequest(_Req):
    model: StrictStr
    input: Union[StrictStr, list[StrictStr], list[StrictInt], list[list[StrictInt]]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Optional[StrictInt] = None
    user: Optional[StrictStr] = None


class ClassifyRequest(_Req):
    model: StrictStr
    text: StrictStr
    labels: Optional[list[StrictStr]] = None
    template: Optional[StrictStr] = None
    normalize: StrictBool = False
    chat: StrictBool = False


class SystemOneRequest(_Req):
    model: StrictStr
    context: Union[StrictStr, list[StrictInt]]
    candidates: list[Union[StrictStr, list[StrictInt]]] = Field(min_length=1)
    normalize: StrictBool = False
