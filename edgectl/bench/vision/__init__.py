"""``edgectl bench`` for a vision-language model: the test images made on the machine
(``images.py``), llama.cpp's GGUF pair converted from the same directory (``gguf_pair.py``), and
the runs that compare edgectl's plan with vLLM as it ships and with llama-server's vision path.
Nothing here imports torch, vLLM or an image library: the engines run in their own processes."""
