"""The rules every namespace shares, in pure Python: no framework is imported here.

``layouts`` (what a gradient's shape means), ``arguments`` (how the two forms of ``custom_gradient`` read their
arguments), ``tolerances`` (the one table of the numerical checks' bounds), ``gradient_report`` (the checker's
report), ``linearity`` (the states a proof of a VJP's linearity gives), ``nesting`` (decorated calls inside a
VJP), ``function_identity`` (when two Python functions are the same), ``closure_key`` (a VJP as a key and the
arrays it closes over, to do a decorator's work once per key) and ``bounded_cache``.
"""
