"""Turns: what one request asks for and gets back — prompt rendering, output specs and grammar
constraints, results and usage, tool-call validation, trace recording, sampling and stops.
Imports grammars/, policy/, record/ and errors; never memory/, models/ or the engine."""
