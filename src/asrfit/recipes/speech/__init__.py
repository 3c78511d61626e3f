"""Speech that sounds like speech: a corpus from three synthesizers, one of them held out.

``engines`` (espeak-ng, flite and Festival behind one ``render``), ``espeak`` (the ctypes
binding), ``voices`` (speakers and the split), ``grammar`` and ``lexicon`` (the sentences),
``augment`` (speed, vocal tract, rooms, noise, channels), ``corpus`` (the writer), ``ngram``
and ``beam`` (a word 3-gram and pyctcdecode's beam search).
"""
