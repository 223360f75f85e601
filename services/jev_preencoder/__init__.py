"""The preencoder: runs a vision-language checkpoint's vision tower once per image and stores the
embeddings as assets (jev_common.assets) that workers splice into prompts without decoding images."""
