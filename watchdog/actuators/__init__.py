"""How the batch allowance reaches the serving layer (gateway, HAProxy, HTTP, command), and the
read-back that proves it did.
"""
