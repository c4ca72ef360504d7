"""What `graft chat` answers with: a run dir or plain LLM dir on HF generate, or either on
graft's engine (when any engine option is given, e.g. `--quantization`). Each is an
`Answerer`: `answer(messages, images, on_text=None) -> str`, with the token count of the last
answer and a banner naming the model. Sampling options are read from `args` on every answer,
so the REPL's /set changes the next one."""

from __future__ import annotations

from graft.errors import GraftConfigError, GraftError


class Answerer:
    """`answer(messages, images, on_text)` -> text; `tokens`: how many the last answer took
    (None before the first); `takes_images`; `banner`: the model and what answers with it."""

    def __init__(self, answer, takes_images: bool, banner: str):
        self._answer, self.takes_images, self.banner = answer, takes_images, banner
        self.tokens = None

    def __call__(self, messages, images, on_text=None) -> str:
        text, self.tokens = self._answer(messages, images, on_text)
        return text


def open_backend(path: str, args) -> Answerer:
    """The answerer for `path` (run dir or LLM dir), loaded once for a REPL."""
    from graft.gguf_llm import model_path
    from graft.run_dir import model_dir_kind
    from graft.serving.engine.engine_args import given_options

    path = str(model_path(path))  # a .gguf file: its LLM dir
    kind = model_dir_kind(path, "PATH")
    engine = bool(given_options(args))  # --quantization, --kv-cache-dtype, ...: only the engine
    backend = _engine_backend if engine else _graft_backend if kind == "run" else _llm_backend
    answer, takes_images = backend(path, args)
    what = "images and text" if takes_images else "text only"
    how = "graft's engine" if engine else "HF generate"
    return Answerer(answer, takes_images, f"graft chat: {path} ({what}; {how}, {args.device})")


def _graft_backend(path: str, args):
    from graft.model import GraftedModel

    model = GraftedModel.from_run(path, device=args.device)
    if args.dtype:
        model.llm.to(_dtype(args.dtype))

    def answer(messages, images, on_text=None):
        text = model.chat(messages, images, max_new_tokens=args.max_new_tokens,
                          temperature=args.temperature, seed=args.seed, top_p=args.top_p,
                          on_text=on_text)
        # chat() hands back text only: its tokens, counted again (the end-of-turn token aside)
        return text, len(model.tokenizer(text, add_special_tokens=False).input_ids)

    return answer, True


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
        new = out[0, len(ids):].tolist()
        return tokenizer.decode(new, skip_special_tokens=True).strip(), len(new)

    return answer, False


def _engine_backend(path: str, args):
    from graft.serving import Engine, EngineConfig, SamplingParams
    from graft.serving.multimodal.front import generate_chats, stream_chat
    from graft.template import encode_chat

    engine = Engine.from_pretrained(path, EngineConfig.from_args(
        args, device=args.device, dtype=args.dtype or "float32"))

    def answer(messages, images, on_text=None):
        params = SamplingParams(temperature=args.temperature, top_p=args.top_p,
                                max_tokens=args.max_new_tokens, seed=args.seed)
        if engine.mm is None:
            _text_only(path, images)
        if on_text is not None:  # the REPL: streamed step by step
            out = stream_chat(engine, messages, images, params, on_text)
        elif engine.mm is not None:  # a run dir: its graft is the default
            out = generate_chats(engine, {"chat": (messages, images)}, params)["chat"]
        else:
            ids = encode_chat(engine.tokenizer, messages, [], add_generation_prompt=True).input_ids
            out = engine.generate(prompt_token_ids=[ids], sampling_params=params)[0]
        if out.finish_reason in ("error", "internal_error"):  # the CLI adds "graft chat: error:"
            raise GraftError(out.error)
        return out.text, len(out.token_ids)

    return answer, engine.mm is not None
