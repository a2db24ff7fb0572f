"""``tokennet explore RUN``: a local page to look inside a run — its tokens drawn where they came from, every
layer's and head's attention drawn on the input itself, the rollout, the prediction, and the prediction with one
head ablated — for every task whose model has attention.

A task names how its runs are explored (``Task.explorer``, an :class:`~.views.Explorer` class): the held-out
examples it lists, what a user may give (text, a picture, a clip, a graph, a question) and how that input
becomes tokens on views (:mod:`.views`; the explorers are :mod:`.pictures`, :mod:`.text` and :mod:`.graphs`).
The numbers are the model's: ``model.attention_maps(inputs)``, the data ``tokennet viz`` draws
(:mod:`.measure`). The server (:mod:`.app`) is Starlette under uvicorn, the stack of ``tokennet serve``; the page
is one HTML file, a script and a style sheet shipped in this package (``static/``), with nothing fetched from
the network. The server needs starlette and uvicorn (``pip install 'tokennet[serve]'``), imported only by
:mod:`.app`, so tasks import their explorers without them.
"""


from .views import Exploration, Explorer

__all__ = ["Explorer", "Exploration"]
