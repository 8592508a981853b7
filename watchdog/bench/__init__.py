"""`llm-watchdog bench`: chat TTFT against batch concurrency, and the extraction-style batch job it
loads the server with.
"""
