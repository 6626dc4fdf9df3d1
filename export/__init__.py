"""kztts.export: Qwen3-TTS checkpoint -> kztts bundle (needs torch, transformers, qwen-tts)."""
