"""An LM that speaks: an LM's reply spoken while it is written (``kztts chat --speak``, serve's spoken
chat completions). Imports ``kztts.tts`` and ``kztts.lm`` (siblings that never import each other) and
the layers below; ``kztts.server`` and the CLI import it.

* ``reply_pieces``: where a reply is cut into the utterances it is spoken in, incrementally and whole;
* ``spoken_reply``: one scheduler interleaving the LM's tokens and the Talker's frames on the shared
  cores, the audio joined as ``kztts synth --sentences`` joins it;
* ``spoken_chat``: a conversation whose replies are spoken (``kztts chat --speak``);
* ``playback``: the listener's clock: time to first audio and the stall time;
* ``player``: the audio device, where the optional ``sounddevice`` package and a device exist."""
