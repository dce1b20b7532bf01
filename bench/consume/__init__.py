"""Consuming: kdaemon's Consumer beside the other clients (``python bench/consume``), the record
decoder (``python bench/consume/decode.py``) and one worker's pipeline
(``python bench/consume/pipeline.py``)."""
