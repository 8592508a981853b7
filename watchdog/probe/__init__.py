"""The canary side: the streaming chat client, stream parsers, probe sets, engine detection, the
fingerprint and the engine's process.
"""
