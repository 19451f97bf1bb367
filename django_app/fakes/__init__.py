"""Fakes of outside services for tests and the demos: real servers on 127.0.0.1."""
