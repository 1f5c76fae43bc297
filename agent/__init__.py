"""agent: searches vLLM configurations, proves each on a real server, proposes the winners."""

__version__ = "0.1.0"
