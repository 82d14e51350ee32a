"""Demo media players: speakers play music, TVs and projectors play shows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from homeassistant.components.media_player import (
    MediaPlayerDeviceClass,
    MediaPlayerEntity,
    MediaPlayerEntityFeature,
    MediaPlayerState,
    MediaType,
)
from homeassistant.const import Platform

from .entity import DemoEntity, demo_platform

VOLUME_STEP = 0.05
FIXTURE_VOLUME_STEP = 0.1
FIXTURE_TRACKS = 20  # a fixture's player numbers its tracks 0-19


@dataclass(frozen=True, slots=True)
class Track:
    """An item of a player's built-in playlist."""

    title: str
    artist: str
    album: str


MUSIC = (
    Track("Clair de Lune", "Claude Debussy", "Suite bergamasque"),
    Track("So What", "Miles Davis", "Kind of Blue"),
    Track("Teardrop", "Massive Attack", "Mezzanine"),
    Track("Hoppípolla", "Sigur Rós", "Takk..."),
    Track("Bloom", "The Paper Kites", "Woodland"),
)
SHOWS = (
    Track("Planet Earth: Mountains", "BBC", "Planet Earth"),
    Track("The Great British Bake Off", "Channel 4", "Season 12"),
    Track("Evening News", "NOS", "Journaal"),
    Track("Cosmos: Standing Up in the Milky Way", "Fox", "Cosmos"),
)

FEATURES = (
    MediaPlayerEntityFeature.PLAY
    | MediaPlayerEntityFeature.PAUSE
    | MediaPlayerEntityFeature.STOP
    | MediaPlayerEntityFeature.NEXT_TRACK
    | MediaPlayerEntityFeature.PREVIOUS_TRACK
    | MediaPlayerEntityFeature.VOLUME_SET
    | MediaPlayerEntityFeature.VOLUME_STEP
    | MediaPlayerEntityFeature.VOLUME_MUTE
    | MediaPlayerEntityFeature.TURN_ON
    | MediaPlayerEntityFeature.TURN_OFF
)


class DemoMediaPlayer(DemoEntity, MediaPlayerEntity):
    """A player with a small built-in playlist and optional sources."""

    _attr_volume_step = VOLUME_STEP

    def apply_options(self, options: dict[str, Any]) -> None:
        """State from house.yaml or a fixture."""
        self._attr_device_class = MediaPlayerDeviceClass(options["device_class"])
        self._attr_state = MediaPlayerState(options["state"])
        self._attr_volume_level = options["volume"] / 100
        self._fixture = bool(options["fixture"])
        if self._fixture:
            self._apply_fixture(options)
            return
        self._attr_is_volume_muted = False
        self._attr_supported_features = FEATURES
        if sources := options["sources"]:
            self._attr_source_list = list(sources)
            self._attr_source = sources[0]
            self._attr_supported_features |= MediaPlayerEntityFeature.SELECT_SOURCE
        is_music = self._attr_device_class in (
            MediaPlayerDeviceClass.SPEAKER,
            MediaPlayerDeviceClass.RECEIVER,
        )
        self._playlist = MUSIC if is_music else SHOWS
        self._attr_media_content_type = MediaType.MUSIC if is_music else MediaType.TVSHOW
        self._index = (options["track"] - 1) % len(self._playlist)

    def _apply_fixture(self, options: dict[str, Any]) -> None:
        """The format's player: a track number and a volume, no titles; the features its
        fixture lists (all when none)."""
        self._attr_volume_step = FIXTURE_VOLUME_STEP
        self._attr_is_volume_muted = options["muted"]
        self._attr_media_content_type = None
        self._playlist = ()
        self._index = options["track"] % FIXTURE_TRACKS
        listed = [MediaPlayerEntityFeature[name] for name in options["features"]
                  if name in MediaPlayerEntityFeature.__members__]  # fmt: skip
        self._attr_supported_features = MediaPlayerEntityFeature(0)
        for feature in listed or [FEATURES]:
            self._attr_supported_features |= feature

    @property
    def _track(self) -> Track | None:
        if self._playlist and self.state in (MediaPlayerState.PLAYING, MediaPlayerState.PAUSED):
            return self._playlist[self._index]
        return None

    @property
    def media_track(self) -> int | None:
        """Position in the playlist (1-based); a fixture's track number while on (not
        for a TV)."""
        if self._fixture:
            if self.state == MediaPlayerState.OFF or self.device_class == "tv":
                return None
            return self._index
        return self._index + 1 if self._track else None

    def _step(self, by: int) -> None:
        """Another track: the playlist's, or a fixture's numbered one."""
        size = len(self._playlist) if self._playlist else FIXTURE_TRACKS
        self._index = (self._index + by) % size

    @property
    def media_title(self) -> str | None:
        """Title of what plays."""
        return track.title if (track := self._track) else None

    @property
    def media_artist(self) -> str | None:
        """Artist (music) or channel (shows)."""
        return track.artist if (track := self._track) else None

    @property
    def media_album_name(self) -> str | None:
        """Album (music) or series (shows)."""
        return track.album if (track := self._track) else None

    def _set_state(self, state: MediaPlayerState) -> None:
        self._attr_state = state
        self.async_write_ha_state()

    async def async_turn_on(self) -> None:
        """On, nothing playing (a fixture's player back at its first track)."""
        if self._fixture:
            self._index = 0
        self._set_state(MediaPlayerState.IDLE)

    async def async_turn_off(self) -> None:
        """Off (a fixture's player back at its first track)."""
        if self._fixture:
            self._index = 0
        self._set_state(MediaPlayerState.OFF)

    async def async_media_play(self) -> None:
        """Play (turning the player on if needed)."""
        self._set_state(MediaPlayerState.PLAYING)

    async def async_media_pause(self) -> None:
        """Pause."""
        self._set_state(MediaPlayerState.PAUSED)

    async def async_media_stop(self) -> None:
        """Stop."""
        self._set_state(MediaPlayerState.IDLE)

    async def async_media_next_track(self) -> None:
        """Next item of the playlist."""
        self._step(1)
        self._set_state(MediaPlayerState.PLAYING)

    async def async_media_previous_track(self) -> None:
        """Previous item of the playlist."""
        self._step(-1)
        self._set_state(MediaPlayerState.PLAYING)

    async def async_set_volume_level(self, volume: float) -> None:
        """Volume 0..1 (to the hundredth: steps of 0.1 land on 0.6, not 0.6000000000000001)."""
        self._attr_volume_level = round(volume, 2)
        self.async_write_ha_state()

    async def async_mute_volume(self, mute: bool) -> None:
        """Mute or unmute."""
        self._attr_is_volume_muted = mute
        self.async_write_ha_state()

    async def async_select_source(self, source: str) -> None:
        """Pick an input."""
        self._attr_source = source
        self.async_write_ha_state()


async_setup_platform = demo_platform(Platform.MEDIA_PLAYER, DemoMediaPlayer)
