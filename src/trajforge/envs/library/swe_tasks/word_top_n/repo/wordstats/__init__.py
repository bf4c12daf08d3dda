from wordstats.counting import count_words

__all__ = ["count_words"]
