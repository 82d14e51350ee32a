"""Demo to-do lists: items can be added, updated and removed (HassListAddItem...)."""

from __future__ import annotations

from typing import Any

from homeassistant.components.todo import (
    TodoItem,
    TodoItemStatus,
    TodoListEntity,
    TodoListEntityFeature,
)
from homeassistant.const import Platform
from homeassistant.util.ulid import ulid_now

from .entity import DemoEntity, demo_platform


class DemoTodoList(DemoEntity, TodoListEntity):
    """A list in memory; its state is the number of items still to do."""

    _attr_supported_features = (
        TodoListEntityFeature.CREATE_TODO_ITEM
        | TodoListEntityFeature.UPDATE_TODO_ITEM
        | TodoListEntityFeature.DELETE_TODO_ITEM
    )

    def apply_options(self, options: dict[str, Any]) -> None:
        """Items from house.yaml or a fixture."""
        self._attr_todo_items = [
            TodoItem(summary=item["summary"], uid=ulid_now(), status=TodoItemStatus(item["status"]))
            for item in options["items"]
        ]

    async def async_create_todo_item(self, item: TodoItem) -> None:
        """Add an item."""
        item.uid = item.uid or ulid_now()
        item.status = item.status or TodoItemStatus.NEEDS_ACTION
        self._attr_todo_items = [*(self._attr_todo_items or []), item]
        self.async_write_ha_state()

    async def async_update_todo_item(self, item: TodoItem) -> None:
        """Replace the item with the same uid."""
        self._attr_todo_items = [
            item if old.uid == item.uid else old for old in self._attr_todo_items or []
        ]
        self.async_write_ha_state()

    async def async_delete_todo_items(self, uids: list[str]) -> None:
        """Remove items."""
        self._attr_todo_items = [i for i in self._attr_todo_items or [] if i.uid not in uids]
        self.async_write_ha_state()


async_setup_platform = demo_platform(Platform.TODO, DemoTodoList)
