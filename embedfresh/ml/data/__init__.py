"""Data: the product-search relevance schema, its generator and its validating reader."""
