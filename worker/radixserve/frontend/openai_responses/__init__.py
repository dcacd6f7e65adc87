"""OpenAI's Responses API (`/v1/responses`) over the chat-completion path, with a response
store for `previous_response_id`, `GET` and `DELETE`."""
