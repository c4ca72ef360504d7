"""Interop with other checkpoints: take parts out of Kimi/Llava (extract), write a run as HF Llava
(export)."""
