"""TetriInfer's length predictor: a request's output length, as a bucket, from its prompt.

TetriInfer (Hu et al., section 3.3) classifies each prompt's decode length into buckets of a
chosen granularity with a small model on the prefill side, and places decodes by it. Here:
a static-embedding encoder whose weights ship inside a wheel (`encoder.py`), a softmax head
trained on the shared trace's text segments (`head.py`, `data.py`), the whole as one saved
model (`model.py`), and its evaluation against the baselines it must beat (`evaluate.py`):
the most common bucket, and the per-kind running means the policies use today.
"""
