from wordstats.counting import count_words, top_words

__all__ = ["count_words", "top_words"]
