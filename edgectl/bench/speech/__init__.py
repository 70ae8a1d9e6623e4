"""``edgectl bench`` for a speech-to-text model: the test audio made on the machine
(``clips.py``), the word error rate (``wer.py``), and the runs that compare vLLM with other
engines on it. Nothing here imports torch, vLLM or a speech engine: they run in their own processes."""
