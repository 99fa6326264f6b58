"""Helpers the tests share: golden files, published runs, the Hugging Face oracle, chat templates."""
