"""What a live worker holds: where its memory goes (``memory``) and what a tokenizer costs
(``tokenizer_cost``)."""
