"""The relevance model: a BERT-style text encoder and an MLP over feature interactions."""
