"""The judge at work: judge models and OpenAI-compatible endpoints write evaluations of items (`judgetrain judge`)."""
