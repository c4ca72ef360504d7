"""What `graft chat` answers with: a run dir or plain LLM dir on HF generate, or either on
graft's engine (when any engine option is given, e.g. `--quantization`). Each is
`answer(messages, images) -> str`."""

from __future__ import annotations

from graft.errors import GraftConfigError


def open_backend(path: str, args):
    """The answering function for `path` (run dir or LLM dir), loaded once for a REPL."""
    from graft.run_dir import model_dir_kind
    from graft.serving.engine.engine_args import given_options

    kind = model_dir_kind(path, "PATH")
    if given_options(args):  # --quantization, --kv-cache-dtype, ...: only the engine has them
        return _engine_backend(path, args)
    if kind == "run":
        from graft.model import GraftedModel

        model = GraftedModel.from_run(path, device=args.device)
        if args.dtype:
            model.llm.to(_dtype(args.dtype))
        return lambda messages, images, on_text=None: model.chat(
            messages, images, max_new_tokens=args.max_new_tokens,
            temperature=args.temperature, seed=args.seed, top_p=args.top_p, on_text=on_text)
    return _llm_backend(path, args)


def _dtype(name: str):
    from graft.model import DTYPES

    return DTYPES[name]


def _text_only(path: str, images) -> None:
    if images:
        raise GraftConfigError(f"{path} is a plain LLM dir (no vision encoder): drop --image "
                               "or pass a run dir written by `graft train`")


def _llm_backend(path: str, args):
    """A bare LLM on HF generate: text only, the same chat template as training."""
    import torch

    from graft.model import load_llm, sampling_kwargs, text_streamer
    from graft.template import encode_chat

    llm, tokenizer = load_llm(path, args.dtype or "float32")
    llm.to(args.device).eval()

    def answer(messages, images, on_text=None):
        _text_only(path, images)
        ids = encode_chat(tokenizer, messages, [], add_generation_prompt=True).input_ids
        kwargs = dict(max_new_tokens=args.max_new_tokens, pad_token_id=tokenizer.pad_token_id,
                      streamer=text_streamer(tokenizer, on_text),
                      **sampling_kwargs(args.temperature, args.top_p, args.seed))
        with torch.no_grad():
            out = llm.generate(torch.tensor([ids], device=llm.device), **kwargs)
        return tokenizer.decode(out[0, len(ids):].tolist(), skip_special_tokens=True).strip()

    return answer


def _engine_backend(path: str, args):
    from graft.serving import Engine, EngineConfig, SamplingParams
    from graft.serving.multimodal.front import generate_chats, stream_chat
    from graft.template import encode_chat

    engine = Engine.from_pretrained(path, EngineConfig.from_args(
        args, device=args.device, dtype=args.dtype or "float32"))
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p,
                            max_tokens=args.max_new_tokens, seed=args.seed)

    def answer(messages, images, on_text=None):
        if engine.mm is None:
            _text_only(path, images)
        if on_text is not None:  # the REPL: streamed step by step
            out = stream_chat(engine, messages, images, params, on_text)
        elif engine.mm is not None:  # a run dir: its graft is the default
            out = generate_chats(engine, {"chat": (messages, images)}, params)["chat"]
        else:
            ids = encode_chat(engine.tokenizer, messages, [], add_generation_prompt=True).input_ids
            out = engine.generate(prompt_token_ids=[ids], sampling_params=params)[0]
        if out.finish_reason in ("error", "internal_error"):
            raise GraftConfigError(f"graft chat: {out.error}")
        return out.text

    return answer
