"""reflex-rag: ingest documents into FAISS indexes on a volume, retrieve, answer with citations.

Layers (one way): loaders -> chunker -> embedder (reflex.Engine.embed) -> index (atomic generations)
-> retrieve (dense, BM25, RRF) -> ask (reflex.Engine.chat). Never imports cupy; the engine's backend
is passed through.
"""
