"""Pure rules of the service, one function each: no I/O, no clock, no database.

The store fetches rows, calls these functions, and writes what they decide.
"""
